"""Bytes other tools wrote, read without their packages: hidet/tilus task files, ELF/cubin/fatbin,
GPU arch names, torch's Mega-Cache framing (the lowest floor, beside fs/)."""
