from fleet_sandbox_broker.app import main

main()
