module keybus/bench/origin_go/nats

go 1.19

require (
	github.com/nats-io/nats.go v1.24.0
	keybus/bench/origin_go v0.0.0
)

require (
	github.com/nats-io/nkeys v0.3.0 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.5.0 // indirect
)

replace keybus/bench/origin_go => ../
