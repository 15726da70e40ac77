from torchchaos.faults.faultfs.daemon import main

main()
