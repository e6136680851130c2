from meshlm.cli.main import main

main()
