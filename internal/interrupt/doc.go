// Package interrupt gives the commands the context they stop on: the first SIGINT (Ctrl-C),
// SIGTERM, or SIGHUP (the terminal closed) ends it, so that a worker hands its jobs back and
// submit says how to go on, where the default action of SIGHUP killed them like kill -9. A
// second Ctrl-C then kills at once, for a person who will not wait for the stop.
//
// A signal the process was started ignoring stays ignored: `nohup submit …` goes on when its
// terminal closes, and a job a non-interactive shell started in the background (`submit … &`,
// which ignores SIGINT) is not stopped by the Ctrl-C meant for the script.
package interrupt
