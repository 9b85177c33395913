"""What a check of a running node is (a command, the judge of its output) and the output
parsers several areas share: below the areas, which list their checks with it, and below
:mod:`provisioner.verify`, which gathers and runs them (docs/design.md, "Layers")."""
