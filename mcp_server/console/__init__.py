"""The operator console: the web front end where a person sees the queue and a task, and
approves, requests changes or settles what the core hands to a person."""
