// Package fleettest starts the real parts that tinkerfleet's tests run against: an embedded
// nats-server with JetStream in a temporary directory, a three-node cluster of them whose
// nodes can be stopped and started again (Cluster), the Tinker simulator over loopback
// HTTP, queues on connections of their own, a dialer whose connections fail a write as a
// socket does when its server goes away (WriteCutter), one whose links go silent as a
// dead network's do (Partition), publishing and reading jobs and results the way
// the programs do, and a Buffer to catch a program's logs in. Nothing here is a mock; it
// only saves each test package from starting the same things again. It is imported by tests
// only.
package fleettest
