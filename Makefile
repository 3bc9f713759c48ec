.PHONY: run test lint bench build

run:
	go run ./cmd/herald

test:
	go test -race -count=1 ./...

lint:
	@test -z "$$(gofmt -l .)" || (gofmt -l . && echo "gofmt: files above need formatting" && exit 1)
	go vet ./...
	go tool golangci-lint run ./...

bench:
	go test -run '^$$' -bench . -benchtime 3s ./queue
	go test -run '^$$' -bench LongPoll -benchtime 1x ./gateway

build:
	go build -o herald ./cmd/herald
