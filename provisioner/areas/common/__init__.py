"""Area common: hostname, /etc/hosts, NTP, admin users, mirrors, sysctl (role common)."""
