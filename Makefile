.PHONY: check-monitoring run test lint bench bench-go bench-peers bench-fanout build demo chaos chaos-short failover

run:
	go run ./cmd/herald

demo:
	go run ./cmd/herald demo

# The reliability suite: three instances, faults, every message checked.
chaos-short:
	go test -tags reliability -count=1 -timeout 10m -run TestChaos -v ./reliability

chaos:
	HERALD_CHAOS_N=1000000 go test -tags reliability -count=1 -timeout 8h -run TestChaos -v ./reliability

# Failover (docs/failover.md): a killed and a hung primary with a promoted
# streaming standby (TestStandby), Patroni and PgBouncer. About 3 minutes:
# not in .ci/run.
failover:
	go test -tags reliability -count=1 -timeout 20m -run 'TestStandby|TestPatroni|TestPgBouncer' -v ./reliability

# The README's test command. The Go SDK (client/) is a module of its own,
# which ./... at the root does not reach: its tests run in there, whether
# the root's pass or not, and the command fails if either half does.
test:
	go test -race -count=1 ./...; a=$$?; (cd client && go test -race -count=1 ./...); b=$$?; [ $$a -eq 0 ] && [ $$b -eq 0 ]

# golangci-lint is pinned in tools/go.mod, a module of its own, so that the
# server's and the SDK's users resolve none of its requirements.
lint:
	@test -z "$$(gofmt -l .)" || (gofmt -l . && echo "gofmt: files above need formatting" && exit 1)
	go vet ./...
	go vet -tags reliability ./reliability
	cd client && go vet ./...
	go tool -modfile=tools/go.mod golangci-lint run --build-tags reliability ./...
	cd client && go tool -modfile=../tools/go.mod golangci-lint run ./...

# herald-bench starts the herald next to it on a private PostgreSQL and
# measures latency per transport, throughput and idle connections.
bench: build
	go build -o bin/herald-bench ./cmd/herald-bench
	./bin/herald-bench --wake notify,logical,poll --out bin/herald-bench.json

bench-go:
	go test -run '^$$' -bench . -benchtime 3s ./queue
	go test -run '^$$' -bench LongPoll -benchtime 1x ./gateway
	go test -run '^$$' -bench CrossInstance -benchtime 1x ./pgnotify

# Herald side by side with NATS JetStream, centrifuge and River: a separate
# module (bench/peers) so the server and the SDK never depend on them.
bench-peers: build
	cd bench/peers && go build -o ../../bin/peers . && ../../bin/peers --herald ../../bin/herald --out ../../bin/bench-peers.md

# One queue followed by 10,000 and 1,000 SSE clients: Herald's follow streams
# beside centrifuge's SSE broadcast (rounds interleaved), then herald-bench's
# fanout on one instance and on three (latency, order, CPU, idle memory).
bench-fanout: build
	go build -o bin/herald-bench ./cmd/herald-bench
	cd bench/peers && go build -o ../../bin/peers . && ../../bin/peers --herald ../../bin/herald --scenario fanout --out ../../bin/bench-fanout-peers.md
	./bin/herald-bench --duration 15s --out bin/herald-bench-fanout.json fanout

build:
	go build -o bin/herald ./cmd/herald

# The alert rules through Prometheus's own checker (builds promtool once,
# a few minutes; not part of make test, which checks every metric they use).
check-monitoring:
	go run github.com/prometheus/prometheus/cmd/promtool@v0.316.0 check rules deploy/prometheus/alerts.yml
