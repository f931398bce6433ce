module shaddock/deploy/nats-exporter

go 1.22
