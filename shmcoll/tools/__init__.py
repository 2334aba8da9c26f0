"""The `shmcoll` command line (cli: one module per subcommand) and the measuring
harness it shares with the benchmark suite (harness)."""
