from kcache_cli.cli.app import run

run()
