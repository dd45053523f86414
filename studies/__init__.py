"""Studies run with the system; each folder holds its committed results and the script that tabulates them."""
