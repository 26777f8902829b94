"""The desktop driver: starts desktops and turns actions into X11 requests and images.

It knows nothing of HTTP. Blocking X11 work runs on one worker thread per desktop.
"""
