"""Every value that crosses a process boundary, defined once.

Each module holds one family of contracts: its producer builds the value
here and its consumers parse it here, so a field is named in exactly one
place and a bad value fails naming that field. Nothing in this package
imports an external system's client.
"""
