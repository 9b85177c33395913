"""One module per `provision` command; ``provisioner.cli`` imports only the chosen one.

Each module has ``run(args, out, err) -> int`` (the command) and ``main(args) -> int``
(``run`` inside :func:`provisioner.commands.common.guarded`: consoles, exit codes, error
messages). A module imports at its top exactly what its command needs, so ``provision
validate`` never loads paramiko, the BMC drivers or ansible-runner.
"""
