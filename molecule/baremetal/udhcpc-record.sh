#!/bin/sh
# busybox udhcpc script for the baremetal scenario: record what the DHCP server offered in
# /run/udhcpc/<interface>.env and put the address on the interface (no routes: the
# container keeps its default route on podman's network).
mkdir -p /run/udhcpc
case "$1" in
  bound|renew)
    {
      echo "ip=$ip"
      echo "subnet=$subnet"
      echo "router=$router"
      echo "dns=$dns"
      echo "domain=$domain"
      echo "siaddr=$siaddr"
      echo "boot_file=$boot_file"
      echo "hostname=$hostname"
    } > "/run/udhcpc/$interface.env"
    ip -4 address flush dev "$interface"
    ip address add "$ip/$subnet" dev "$interface"
    ;;
  deconfig)
    rm -f "/run/udhcpc/$interface.env"
    ;;
esac
exit 0
