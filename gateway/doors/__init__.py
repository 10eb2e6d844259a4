"""The front doors: each protocol a client may speak, parsed into one canonical request
(``base``) and answered in its own protocol."""
