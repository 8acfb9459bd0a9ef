"""Leases and fencing tokens: issuers (postgres built in; etcd, zookeeper behind extras)."""
