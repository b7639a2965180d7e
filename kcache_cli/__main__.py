from kcache_cli.cli.entry import run

run()
