"""Devices and links: profiles (one TOML per device kind), the cluster (nodes and the link a
group of ranks uses) and collective times under the alpha-beta ring model."""
