from vesper.coordinator.cli import main

main()
