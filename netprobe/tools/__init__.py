"""Built-in tool plugins; each registers through the netprobe.tools entry-point group."""
