"""What commands do with a catalog: verify, diff, budget, config, explain, usage, build, repair and
delete (the engines floor, beside archive/ and remote/)."""
