from fleet_quality.app import main

main()
