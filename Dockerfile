# Herald's image: built from source in one stage, run from a small non-root
# one (distroless static: no shell, no package manager; the binary is static).
#
#   docker build -t herald:local .
#   docker run -p 6632:6632 -e HERALD_DATABASE_URL=postgres://… herald:local
#
# The image needs a database URL: the private PostgreSQL that `herald serve`
# starts without one needs initdb, which this image does not carry.
FROM golang:1.26-bookworm AS build
WORKDIR /src
# The Go SDK is a module of its own that go.mod replaces with ./client:
# its go.mod must be there before the download.
COPY go.mod go.sum ./
COPY client/go.mod client/go.sum ./client/
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/herald ./cmd/herald

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/herald /usr/local/bin/herald
USER nonroot:nonroot
# A directory the nonroot user may write: the push buffer of push
# maintenance lives in ./.herald/buffer (--buffer-dir). Mount a volume there
# to keep buffered pushes across containers, not only restarts.
WORKDIR /home/nonroot
# HTTP (API, WebSocket, SSE, the demo page) and syncnet (UDP).
EXPOSE 6632/tcp 6633/udp
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=10 CMD ["/usr/local/bin/herald", "health"]
ENTRYPOINT ["/usr/local/bin/herald"]
CMD ["serve"]
