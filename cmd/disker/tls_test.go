package main_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pki is a CA made for a test, with a server and a client certificate it
// signed, written as PEM files in dir (paths in the other fields).
type pki struct {
	dir                                              string
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	p := &pki{dir: dir}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	now := time.Now()
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "disker test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p.ca = write("ca.crt", "CERTIFICATE", caDER)
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage, certFile, keyFile string) (string, string) {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
			tmpl.DNSNames = []string{"redis.test"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(certFile, "CERTIFICATE", der), write(keyFile, "EC PRIVATE KEY", kder)
	}
	p.serverCert, p.serverKey = leaf(2, "redis.test", x509.ExtKeyUsageServerAuth, "server.crt", "server.key")
	p.clientCert, p.clientKey = leaf(3, "disker client", x509.ExtKeyUsageClientAuth, "client.crt", "client.key")
	return p
}

// startTLSRedis starts a redis-server that speaks only TLS and requires a
// client certificate signed by p's CA, and returns its address.
func startTLSRedis(t *testing.T, p *pki) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command("redis-server", "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", p.serverCert, "--tls-key-file", p.serverKey, "--tls-ca-cert-file", p.ca,
		"--tls-auth-clients", "yes", "--save", "", "--appendonly", "no", "--dir", p.dir, "--logfile", "redis.log")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	waitFor(t, 20*time.Second, "redis-server to accept connections", func() bool {
		log, _ := os.ReadFile(filepath.Join(p.dir, "redis.log"))
		select {
		case <-done:
			t.Fatalf("redis-server exited (built without TLS?):\n%s", log)
		default:
		}
		return strings.Contains(string(log), "Ready to accept connections")
	})
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// TestTLSRedis runs a worker and a sender over TLS to a redis-server that
// requires client certificates, with the --tls-* flags and their DISKER_
// variables, and checks what happens when something is missing or wrong.
func TestTLSRedis(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	addr := startTLSRedis(t, p)
	e := newEnv(t)
	e.redisURL = "rediss://" + addr + "/0"
	e.extra = []string{"DISKER_TLS_CA=" + p.ca, "DISKER_TLS_CERT=" + p.clientCert, "DISKER_TLS_KEY=" + p.clientKey}
	e.startWorker("--receiver", "upper", "--exec", "tr a-z A-Z")
	if out, errOut, code := e.run("", "send", "--to", "upper", "--wait", "over tls"); code != 0 || out != "OVER TLS" {
		t.Fatalf("send over TLS: exit %d %q %s", code, out, errOut)
	}
	// The same with flags, and a server name of the certificate's.
	e.extra = nil
	tlsFlags := []string{"--tls-ca", p.ca, "--tls-cert", p.clientCert, "--tls-key", p.clientKey}
	args := append([]string{"send", "--to", "upper", "--wait", "--tls-server-name", "redis.test", "flags"}, tlsFlags...)
	if out, errOut, code := e.run("", args...); code != 0 || out != "FLAGS" {
		t.Fatalf("send with --tls-* flags: exit %d %q %s", code, out, errOut)
	}
	// Verification off, loudly: no CA given, the reply comes, a warning is logged.
	args = []string{"send", "--to", "upper", "--wait", "--tls-insecure-skip-verify", "--tls-cert", p.clientCert, "--tls-key", p.clientKey, "insecure"}
	if out, errOut, code := e.run("", args...); code != 0 || out != "INSECURE" || !strings.Contains(errOut, "NOT verified") {
		t.Fatalf("send --tls-insecure-skip-verify: exit %d %q %s", code, out, errOut)
	}

	plainAddr := strings.TrimSuffix(strings.TrimPrefix(redisURL, "redis://"), "/0")
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no CA", []string{"stats", "--tls-cert", p.clientCert, "--tls-key", p.clientKey}, 1, "--tls-ca (DISKER_TLS_CA)"},
		{"wrong server name", append([]string{"stats", "--tls-server-name", "other.test"}, tlsFlags...), 1, "--tls-server-name (DISKER_TLS_SERVER_NAME)"},
		{"no client certificate", []string{"stats", "--tls-ca", p.ca}, 1, "want a client certificate: --tls-cert and --tls-key"},
		{"cert without key", []string{"stats", "--tls-ca", p.ca, "--tls-cert", p.clientCert}, 2, "--tls-cert needs --tls-key"},
		{"skip_verify in the URL", []string{"stats", "--redis-url", e.redisURL + "?skip_verify=true"}, 2, "--tls-insecure-skip-verify"},
		{"redis:// at the TLS port", []string{"stats", "--redis-url", "redis://" + addr + "/0"}, 1, "closed one without answering PING; is it a TLS port? (use rediss:// for one)"},
	} {
		_, errOut, code := e.run("", c.args...)
		if said := withoutLogs(errOut); code != c.code || !strings.Contains(said, c.want) {
			t.Errorf("%s: exit %d, %q; want exit %d and %q", c.name, code, said, c.code, c.want)
		}
	}

	// rediss:// at a plain-text Redis: a plain-text server waits for more
	// of the TLS hello for ever; the command gives up on it well before the
	// 5s connect timeout and says why.
	start := time.Now()
	_, errOut, code := e.run("", "stats", "--redis-url", "rediss://"+plainAddr+"/0", "--tls-ca", p.ca)
	took := time.Since(start)
	if said := withoutLogs(errOut); code != 1 || !strings.Contains(said, "did not answer TLS") {
		t.Errorf("rediss:// at a plain-text port: exit %d, %q; want 1 and \"did not answer TLS\"", code, said)
	}
	if took >= 5*time.Second {
		t.Errorf("rediss:// at a plain-text port took %v to fail: the connect timeout, not the TLS probe", took)
	}
}
