"""The sidecar of one learner: runs it, reports it to etcd, ships its logs, stores its outputs."""
