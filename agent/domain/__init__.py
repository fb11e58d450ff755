"""Pure domain: envelope, workspace context, task record, states, dispositions.

Nothing here imports another part of the project or any vendor library.
"""
