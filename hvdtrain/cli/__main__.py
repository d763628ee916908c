"""``python -m hvdtrain.cli ARGS`` runs ``hvdtrain ARGS`` (as ``hvdtrain env --hosts`` does on each host)."""

from hvdtrain.cli import main

main(prog_name="hvdtrain")
