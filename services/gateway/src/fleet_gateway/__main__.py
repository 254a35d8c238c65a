from fleet_gateway.app import main

main()
