package main

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// listen binds a TCP address, and says how to pick another when it is
// taken: flag and env name the setting that chose it.
func listen(addr, flag, env string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, bindError(addr, flag, env, err)
	}
	return ln, nil
}

// probeUDP checks that a UDP address can be bound (syncnet binds it later,
// once the database is up) and gives it back at once.
func probeUDP(addr string) error {
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

func bindError(addr, flag, env string, err error) error {
	return portError(addr, flag, err, fmt.Sprintf("(another herald, or another program, listens there): stop it, "+
		"or choose another address with %s (or %s), e.g. %s %s", flag, env, flag, freeAddr(addr)))
}

// portError says that addr, chosen by flag, is taken (and fix, how to
// choose another), or why else it cannot be bound.
func portError(addr, flag string, err error, fix string) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s is already in use %s", addr, fix)
	}
	return fmt.Errorf("cannot listen on %s (%s): %w", addr, flag, err)
}

// freeAddr suggests addr's host with a port that is free right now.
func freeAddr(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = ""
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return net.JoinHostPort(host, "0") + " (any free port)"
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}
