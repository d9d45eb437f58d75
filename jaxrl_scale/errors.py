"""The one exception type that reaches the user as a one-line message."""


class UserError(Exception):
  """Bad input from the user (config, file, flag): the CLI prints it as one line, no traceback.

  The message must name the offending thing: the file, the key, the row or the column.
  """


def check_flags(checks) -> None:
  """Raises UserError for the first (flag, value, ok) whose ok is false: `--n: invalid value 0`."""
  for flag, value, ok in checks:
    if not ok:
      raise UserError(f"{flag}: invalid value {value}")
