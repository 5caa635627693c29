"""Plugin contracts other CLIs consume."""
