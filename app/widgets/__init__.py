"""The main window's panels, one file each."""
