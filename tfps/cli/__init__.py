"""The command-line layer: the only modules that define or read absl flags. They build the settings the layers below
take (`flags`, `model_flags`) and are the console scripts of setup.cfg (`launch`: tfps-launch, `config`: tfps-config,
`k8s`: tfps-k8s, `report`: tfps-report)."""
