"""The console's screens: session picker, main console, layer detail, help, confirmation."""
