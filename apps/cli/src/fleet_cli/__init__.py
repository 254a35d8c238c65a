"""`fleet`, the command line: the local launcher (`fleet up`) and a client of the gateway
(`fleet status`). Imports the shared libs; imports no service (it starts them as processes)."""
