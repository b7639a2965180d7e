"""Small services every floor may use: errors, units, terminal-safe text, worker pools, progress and
signing (the lowest floor, beside fs/)."""
