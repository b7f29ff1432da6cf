//go:build !linux

package bench

import "syscall"

// childAttr sets nothing outside Linux: a peer's server is stopped by the
// harness's close, not by the kernel when the harness dies.
func childAttr(syscall.Signal, *syscall.Credential) *syscall.SysProcAttr { return nil }

// unprivilegedUser returns nil outside Linux: the harness runs servers as
// its own user.
func unprivilegedUser(string) (*syscall.Credential, error) { return nil, nil }
