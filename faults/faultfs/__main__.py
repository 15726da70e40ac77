from faults.faultfs.daemon import main

main()
