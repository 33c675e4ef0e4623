"""`prefixwatch demo`: the whole stack on one machine, without Docker (wiring: may import every
product)."""

from prefixwatch.demo.run import add_demo_parser, run_demo

__all__ = ["add_demo_parser", "run_demo"]
