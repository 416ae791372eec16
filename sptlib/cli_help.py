"""`--help` of the command lines: the command's docstring and every flag it defined (absl's own
`--help` lists only the `__main__` module's flags). JAX-free (the foundation)."""

import sys

HELP_ARGS = ("-h", "-?", "-help", "--help", "--helpshort")


def print_flags_help(prog: str, doc=None, *, full=False, stream=None):
    """`--help`: `doc` (default: the `__main__` module's docstring), then every flag the command
    defined (absl's own `--help` lists only the `__main__` module's flags, so a command whose
    flags live in another module listed none); `full` adds absl's and other libraries' flags."""
    from absl import flags  # pylint: disable=import-outside-toplevel
    stream = stream or sys.stdout
    doc = doc if doc is not None else (getattr(sys.modules.get("__main__"), "__doc__", "") or "")
    by_module = flags.FLAGS.flags_by_module_dict()
    mine = sorted(m for m in by_module if full or not m.startswith(("absl", "jax", "ml_collections")))
    lines = [doc.strip(), "", f"{prog} flags:"] if doc.strip() else [f"{prog} flags:"]
    for flag in sorted({f for m in mine for f in by_module[m]}, key=lambda f: f.name):
        help_text = flags.text_wrap(f"--{'[no]' if flag.boolean else ''}{flag.name}: "
                                    f"{flag.help}", indent="    ", firstline_indent="  ")
        default = "" if flag.default in (None, "") else f"\n    (default: {flag.default_as_str})"
        lines.append(help_text + default)
    if not full:
        lines.append("\n--helpfull lists absl's own flags too.")
    stream.write("\n".join(lines) + "\n")
    stream.flush()
