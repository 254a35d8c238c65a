from fleet_budget.app import main

main()
