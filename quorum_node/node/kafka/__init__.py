"""The Kafka protocol of the controller listener: the admin RPCs Kafka's tools send to
controllers (KIP-919), over the same admin service as the HTTP admin API."""
