.PHONY: run test lint bench bench-go build demo

run:
	go run ./cmd/herald

demo:
	go run ./cmd/herald demo

test:
	go test -race -count=1 ./...

lint:
	@test -z "$$(gofmt -l .)" || (gofmt -l . && echo "gofmt: files above need formatting" && exit 1)
	go vet ./...
	go tool golangci-lint run ./...

# herald-bench starts the herald next to it on a private PostgreSQL and
# measures latency per transport, throughput and idle connections.
bench: build
	go build -o bin/herald-bench ./cmd/herald-bench
	./bin/herald-bench --out bin/herald-bench.json

bench-go:
	go test -run '^$$' -bench . -benchtime 3s ./queue
	go test -run '^$$' -bench LongPoll -benchtime 1x ./gateway
	go test -run '^$$' -bench CrossInstance -benchtime 1x ./pgnotify

build:
	go build -o bin/herald ./cmd/herald
