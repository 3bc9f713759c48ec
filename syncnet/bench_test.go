package syncnet

import (
	"net"
	"testing"
	"time"
)

// benchNode is a node with one peer, not running: handle and send are
// measured without the socket's syscalls.
func benchNode(b *testing.B) *Node {
	b.Helper()
	nd, err := New(Config{Bind: "127.0.0.1:0", ServerID: "bench:1", Secret: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		Waker: WakerFunc(func(_, _, _ string) {}), Peers: []string{"127.0.0.1:9"}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = nd.Close() })
	return nd
}

// BenchmarkNode_HandleHeartbeat is a heartbeat's receipt: verify, decode,
// replay check, health.
func BenchmarkNode_HandleHeartbeat(b *testing.B) {
	nd := benchNode(b)
	from := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}
	var seq uint64
	b.ReportAllocs()
	for b.Loop() {
		seq++
		p, _ := Marshal(HeartbeatPayload{Sequence: seq, SessionID: "0123456789abcdef", TS: uint64(time.Now().UnixMilli())})
		d, _ := Encode(Header{Type: Heartbeat, SenderID: "peer:1", Session: "0123456789abcde", Sequence: seq}, p, nd.key)
		nd.handle(d, from.AddrPort())
	}
}

// BenchmarkEncodeHeartbeat is a heartbeat's making: marshal and sign.
func BenchmarkEncodeHeartbeat(b *testing.B) {
	key := []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	var seq uint64
	b.ReportAllocs()
	for b.Loop() {
		seq++
		p, _ := Marshal(HeartbeatPayload{Sequence: seq, SessionID: "0123456789abcdef", TS: 1})
		_, _ = Encode(Header{Type: Heartbeat, SenderID: "peer:1", Session: "0123456789abcde", Sequence: seq}, p, key)
	}
}
