from simulator.server.process import main

main()
