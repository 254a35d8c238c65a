from fleet_agent.app import main

main()
