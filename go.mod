module github.com/molt-sh/molt

go 1.26.8

require (
	github.com/checkpoint-restore/go-criu/v7 v7.2.0
	github.com/spf13/cobra v1.10.2
	go.etcd.io/bbolt v1.5.0
	golang.org/x/sys v0.50.0
	google.golang.org/protobuf v1.34.2
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
)
