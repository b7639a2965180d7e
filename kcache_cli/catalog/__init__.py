"""What a command knows of its caches: roots found and vetted (locate), selections parsed (names), one
scan per root (scan, scan_context) and the index in front of it (the engines floor)."""
