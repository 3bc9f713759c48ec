package pgtest

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// Proxy is a TCP proxy on loopback in front of the test database, for
// tests of what Herald does when its connections break: it can cut every
// connection (CutAll), cut the answer of one statement after the server
// sent it (CutAnswer: the statement ran and committed, the client never
// reads its rows), or freeze (Freeze: connections stay open and nothing
// moves either way, new ones hang; a hung server).
type Proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]bool
	cutCol  string            // CutAnswer's marker; "" when not armed
	cutNext map[net.Conn]bool // servers whose next answer is cut: their client sent the marker
	cutDone chan struct{}     // closed when the armed cut happened
	frozen  chan struct{}     // non-nil while frozen: closed by Thaw
	wg      sync.WaitGroup
	closed  bool
}

// NewProxy starts a proxy to the test database and returns it with dsn
// (a DSN from DSN(t) or AdminURL) pointed at it. It stops with the test.
func NewProxy(t testing.TB, dsn string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Fatalf("pgtest: the proxy needs a postgres:// URL, not %q", dsn)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: proxy listening: %v", err)
	}
	p := &Proxy{t: t, ln: ln, target: u.Host, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// track adds (or, with add false, removes) c; it reports false once the
// proxy is closed.
func (p *Proxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !add {
		delete(p.conns, c)
		return true
	}
	if p.closed {
		return false
	}
	p.conns[c] = true
	return true
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	p.waitThawed()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	if !p.track(client, true) || !p.track(server, true) {
		_ = client.Close()
		_ = server.Close()
		return
	}
	closeBoth := func() {
		_ = client.Close()
		_ = server.Close()
	}
	var once sync.Once
	done := make(chan struct{}, 2)
	go func() { // client → server
		p.pipe(server, client, false, server)
		once.Do(closeBoth)
		done <- struct{}{}
	}()
	p.pipe(client, server, true, server) // server → client, message by message
	once.Do(closeBoth)
	<-done
	p.track(client, false)
	p.track(server, false)
}

// pipe copies src to dst; fromServer reads the backend's messages one by
// one, so that an armed CutAnswer can drop what follows a RowDescription.
func (p *Proxy) pipe(dst, src net.Conn, fromServer bool, server net.Conn) {
	if !fromServer {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.markRequest(server, buf[:n])
				p.waitThawed()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(src, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
		if n < 0 || n > 1<<30 {
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(src, body); err != nil {
			return
		}
		p.waitThawed()
		if p.takeNext(server) {
			return // the whole answer (Postgres sends a small one at once, after running it) is dropped
		}
		if _, err := dst.Write(append(hdr[:], body...)); err != nil {
			return
		}
		if hdr[0] == 'T' && p.takeCut(body) {
			return // the rows, CommandComplete and ReadyForQuery never arrive
		}
	}
}

// markRequest arms the cut of server's next answer if a request holds the
// marker.
func (p *Proxy) markRequest(server net.Conn, req []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cutCol == "" || !bytes.Contains(req, []byte(p.cutCol)) {
		return
	}
	p.cutCol = ""
	if p.cutNext == nil {
		p.cutNext = map[net.Conn]bool{}
	}
	p.cutNext[server] = true
}

// takeNext reports whether server's answer is to be cut, closing the
// armed channel.
func (p *Proxy) takeNext(server net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cutNext[server] {
		return false
	}
	delete(p.cutNext, server)
	close(p.cutDone)
	return true
}

// takeCut reports (once) whether a RowDescription names the armed column.
func (p *Proxy) takeCut(rowDesc []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cutCol == "" || !bytes.Contains(rowDesc, []byte(p.cutCol+"\x00")) {
		return false
	}
	p.cutCol = ""
	close(p.cutDone)
	return true
}

// CutAnswer arms a one-shot cut, of whichever comes first: the next
// answer whose row description names marker as a column is forwarded up
// to that description; the next answer to a request whose bytes hold
// marker (its SQL text, or a parameter such as a payload) is dropped
// whole. Its connection is then closed both ways. The server has run the
// request by then (and committed it: Postgres sends a small answer only
// with its ReadyForQuery, after the commit of an autocommit statement or
// of a pipeline's COMMIT). A statement pgx has prepared on a connection
// before is answered with no row description. The channel is closed once
// the cut happened.
func (p *Proxy) CutAnswer(marker string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutCol, p.cutDone = strings.TrimSpace(marker), make(chan struct{})
	return p.cutDone
}

// CutAll closes every connection through the proxy; new ones are
// accepted.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Freeze stops every byte in both directions and holds new connections
// unanswered, as a hung server (SIGSTOP) or a black-holed host would,
// until Thaw.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
}

// Thaw lets bytes through again.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}

func (p *Proxy) waitThawed() {
	p.mu.Lock()
	f := p.frozen
	p.mu.Unlock()
	if f != nil {
		<-f
	}
}

// Close stops the proxy and closes its connections (after Thaw).
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.Thaw()
	_ = p.ln.Close()
	p.CutAll()
	p.wg.Wait()
}
