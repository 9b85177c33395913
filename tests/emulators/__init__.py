"""Protocol emulators for tests: a Redfish BMC (sushy-tools' emulator with its fake
driver), an IPMI BMC (a pyghmi BMC with power cycle and real boot flags), a tiny SSH
server and a fake node that "installs" when it PXE boots. Everything listens on
127.0.0.1 on ports chosen at runtime and stops when its context manager exits."""
