package bench

import (
	"os/user"
	"strconv"
	"syscall"
)

// childAttr makes a child process get sig when this process dies, so that
// a peer's server or client never outlives the harness, and, with cred set,
// run as that user.
func childAttr(sig syscall.Signal, cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: sig, Credential: cred}
}

// unprivilegedUser returns, when this process runs as root, the
// credentials of the named system user, for servers that refuse to run as
// root (PostgreSQL); nil when it does not run as root.
func unprivilegedUser(name string) (*syscall.Credential, error) {
	if syscall.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
