from kcache_cli.cli.app import main

main()
