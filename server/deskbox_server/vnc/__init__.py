"""The live view: RFB parsing and proxying, per-session VNC servers, the noVNC page."""
