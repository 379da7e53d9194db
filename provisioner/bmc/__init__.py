"""Out-of-band BMC layer: inventory variables (`config`), firmware component names and comparison (`components`,
`firmware`, both pure) and the Redfish client (`redfish`, over OpenStack's `sushy`, imported only when a command
talks to a BMC). docs/bmc.md describes the variables, the commands and the hand-off to MAAS/Ironic/PXE."""
